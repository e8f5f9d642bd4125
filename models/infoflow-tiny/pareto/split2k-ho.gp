$D0 << EOD
1.00000 0.90000
EOD
$D1 << EOD
0.03493 0.03333
EOD
$D2 << EOD
0.06793 0.16667
0.08500 0.16667
0.14064 0.20000
0.23957 0.23333
0.30394 0.26667
0.48998 0.43333
0.67965 0.66667
EOD
$D3 << EOD
0.10610 0.20000
0.14783 0.26667
0.25935 0.56667
0.41821 0.90000
0.48984 0.90000
0.61021 0.90000
0.76127 0.90000
EOD
$D4 << EOD
0.54281 0.56667
0.54725 0.90000
0.57971 0.90000
0.61952 0.90000
0.64202 0.90000
0.71906 0.90000
0.82502 0.90000
EOD
$D5 << EOD
0.54667 0.40000
0.54946 0.90000
0.58090 0.90000
0.62475 0.90000
0.64190 0.90000
0.71605 0.90000
0.81565 0.90000
EOD
$D6 << EOD
0.04712 0.03333
0.05142 0.03333
0.06434 0.16667
0.09183 0.16667
0.14759 0.20000
0.23608 0.20000
EOD
$D7 << EOD
0.05580 0.03333
0.07350 0.03333
0.12578 0.06667
0.22173 0.10000
0.25431 0.10000
0.40241 0.10000
0.58709 0.16667
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
