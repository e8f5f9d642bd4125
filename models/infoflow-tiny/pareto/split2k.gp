$D0 << EOD
1.00000 0.93333
EOD
$D1 << EOD
0.03504 0.00000
EOD
$D2 << EOD
0.06710 0.06667
0.08371 0.10000
0.13892 0.10000
0.22958 0.20000
0.30271 0.23333
0.48809 0.43333
0.67090 0.63333
EOD
$D3 << EOD
0.10504 0.16667
0.14830 0.23333
0.25997 0.60000
0.41793 0.86667
0.48525 0.93333
0.61265 0.93333
0.75966 0.93333
EOD
$D4 << EOD
0.54632 0.63333
0.55632 0.93333
0.58135 0.93333
0.62417 0.93333
0.64775 0.93333
0.72939 0.93333
0.81946 0.93333
EOD
$D5 << EOD
0.54436 0.56667
0.55204 0.96667
0.57907 0.93333
0.62771 0.93333
0.65185 0.93333
0.71968 0.93333
0.81370 0.93333
EOD
$D6 << EOD
0.04567 0.00000
0.04892 0.00000
0.05804 0.10000
0.07976 0.10000
0.12019 0.13333
0.20983 0.16667
EOD
$D7 << EOD
0.05682 0.00000
0.07268 0.00000
0.12695 0.00000
0.21804 0.00000
0.26219 0.00000
0.40642 0.03333
0.59784 0.16667
EOD
set title "split seed 0, 8 chunks x 220 words, 30 examples"
set xlabel "TTFT / FULL (median over examples)"
set ylabel "exact match"
set xrange [0:1.05]
set yrange [0:1.02]
set grid
set key outside right top
set terminal svg size 760,420 noenhanced font "sans,11" background rgb "white"
set output "models/infoflow-tiny/pareto/split2k.svg"
plot $D0 using 1:2 with linespoints lw 2 pt 5 ps 0.9 lc rgb "#000000" title "FULL", \
  $D1 using 1:2 with linespoints lw 2 pt 6 ps 0.9 lc rgb "#999999" title "NONE", \
  $D2 using 1:2 with linespoints lw 2 pt 7 ps 0.9 lc rgb "#1f77b4" title "INFOFLOW", \
  $D3 using 1:2 with linespoints lw 2 pt 8 ps 0.9 lc rgb "#d62728" title "INFOFLOW_BLEND", \
  $D4 using 1:2 with linespoints lw 2 pt 9 ps 0.9 lc rgb "#2ca02c" title "CACHEBLEND", \
  $D5 using 1:2 with linespoints lw 2 pt 10 ps 0.9 lc rgb "#ff7f0e" title "CACHEBLEND_PARTIAL", \
  $D6 using 1:2 with linespoints lw 2 pt 11 ps 0.9 lc rgb "#9467bd" title "EPIC", \
  $D7 using 1:2 with linespoints lw 2 pt 12 ps 0.9 lc rgb "#8c564b" title "RANDOM"
set terminal pngcairo size 760,420 noenhanced font "sans,9"
set output "models/infoflow-tiny/pareto/split2k.png"
replot
