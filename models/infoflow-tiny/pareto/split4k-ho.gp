$D0 << EOD
1.00000 0.75000
EOD
$D1 << EOD
0.02310 0.10000
EOD
$D2 << EOD
0.06733 0.15000
0.12260 0.15000
0.19214 0.20000
0.26491 0.35000
0.44789 0.50000
0.67027 0.55000
EOD
$D3 << EOD
0.29168 0.40000
0.32395 0.75000
0.38443 0.75000
0.44882 0.75000
0.50137 0.75000
0.66068 0.75000
EOD
$D4 << EOD
0.45247 0.75000
0.50241 0.75000
0.52983 0.75000
0.54407 0.75000
0.59339 0.75000
0.68333 0.75000
EOD
$D5 << EOD
0.45443 0.75000
0.45619 0.75000
0.50293 0.75000
0.58433 0.75000
0.59151 0.75000
0.73339 0.75000
EOD
$D6 << EOD
0.02738 0.10000
0.02850 0.10000
0.04506 0.10000
0.07021 0.10000
0.09079 0.10000
0.13648 0.15000
EOD
$D7 << EOD
0.05068 0.10000
0.09537 0.10000
0.13263 0.10000
0.18441 0.10000
0.34889 0.10000
0.51353 0.10000
EOD
set title "split seed 2, 14 chunks x 230 words, 20 examples"
set xlabel "TTFT / FULL (median over examples)"
set ylabel "exact match"
set xrange [0:1.05]
set yrange [0:1.02]
set grid
set key outside right top
set terminal svg size 760,420 noenhanced font "sans,11" background rgb "white"
set output "models/infoflow-tiny/pareto/split4k-ho.svg"
plot $D0 using 1:2 with linespoints lw 2 pt 5 ps 0.9 lc rgb "#000000" title "FULL", \
  $D1 using 1:2 with linespoints lw 2 pt 6 ps 0.9 lc rgb "#999999" title "NONE", \
  $D2 using 1:2 with linespoints lw 2 pt 7 ps 0.9 lc rgb "#1f77b4" title "INFOFLOW", \
  $D3 using 1:2 with linespoints lw 2 pt 8 ps 0.9 lc rgb "#d62728" title "INFOFLOW_BLEND", \
  $D4 using 1:2 with linespoints lw 2 pt 9 ps 0.9 lc rgb "#2ca02c" title "CACHEBLEND", \
  $D5 using 1:2 with linespoints lw 2 pt 10 ps 0.9 lc rgb "#ff7f0e" title "CACHEBLEND_PARTIAL", \
  $D6 using 1:2 with linespoints lw 2 pt 11 ps 0.9 lc rgb "#9467bd" title "EPIC", \
  $D7 using 1:2 with linespoints lw 2 pt 12 ps 0.9 lc rgb "#8c564b" title "RANDOM"
set terminal pngcairo size 760,420 noenhanced font "sans,9"
set output "models/infoflow-tiny/pareto/split4k-ho.png"
replot
