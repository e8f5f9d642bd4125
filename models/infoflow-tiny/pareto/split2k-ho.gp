$D0 << EOD
1.00000 0.90000
EOD
$D1 << EOD
0.03621 0.03333
EOD
$D2 << EOD
0.08402 0.16667
0.13724 0.20000
0.22371 0.23333
0.28552 0.26667
0.46272 0.43333
0.64474 0.66667
EOD
$D3 << EOD
0.32978 0.46667
0.35046 0.93333
0.43187 0.90000
0.45968 0.90000
0.59919 0.90000
0.77292 0.90000
EOD
$D4 << EOD
0.55100 0.90000
0.59322 0.90000
0.59388 0.90000
0.59513 0.90000
0.70029 0.90000
0.80753 0.90000
EOD
$D5 << EOD
0.54002 0.90000
0.58358 0.90000
0.58810 0.90000
0.63751 0.90000
0.73348 0.90000
0.84613 0.90000
EOD
$D6 << EOD
0.04778 0.03333
0.05375 0.03333
0.05859 0.16667
0.10041 0.16667
0.13971 0.20000
0.24140 0.20000
EOD
$D7 << EOD
0.07097 0.03333
0.12246 0.06667
0.21162 0.10000
0.24621 0.10000
0.37583 0.10000
0.55724 0.16667
EOD
set title "split seed 1, 10 chunks x 180 words, 30 examples"
set xlabel "TTFT / FULL (median over examples)"
set ylabel "exact match"
set xrange [0:1.05]
set yrange [0:1.02]
set grid
set key outside right top
set terminal svg size 760,420 noenhanced font "sans,11" background rgb "white"
set output "models/infoflow-tiny/pareto/split2k-ho.svg"
plot $D0 using 1:2 with linespoints lw 2 pt 5 ps 0.9 lc rgb "#000000" title "FULL", \
  $D1 using 1:2 with linespoints lw 2 pt 6 ps 0.9 lc rgb "#999999" title "NONE", \
  $D2 using 1:2 with linespoints lw 2 pt 7 ps 0.9 lc rgb "#1f77b4" title "INFOFLOW", \
  $D3 using 1:2 with linespoints lw 2 pt 8 ps 0.9 lc rgb "#d62728" title "INFOFLOW_BLEND", \
  $D4 using 1:2 with linespoints lw 2 pt 9 ps 0.9 lc rgb "#2ca02c" title "CACHEBLEND", \
  $D5 using 1:2 with linespoints lw 2 pt 10 ps 0.9 lc rgb "#ff7f0e" title "CACHEBLEND_PARTIAL", \
  $D6 using 1:2 with linespoints lw 2 pt 11 ps 0.9 lc rgb "#9467bd" title "EPIC", \
  $D7 using 1:2 with linespoints lw 2 pt 12 ps 0.9 lc rgb "#8c564b" title "RANDOM"
set terminal pngcairo size 760,420 noenhanced font "sans,9"
set output "models/infoflow-tiny/pareto/split2k-ho.png"
replot
