$D0 << EOD
1.00000 0.75000
EOD
$D1 << EOD
0.02136 0.10000
EOD
$D2 << EOD
0.05038 0.10000
0.07078 0.15000
0.12911 0.15000
0.20819 0.20000
0.27514 0.35000
0.45809 0.50000
0.67554 0.55000
EOD
$D3 << EOD
0.08349 0.20000
0.12855 0.35000
0.24288 0.50000
0.37545 0.75000
0.44593 0.75000
0.58457 0.75000
0.73887 0.75000
EOD
$D4 << EOD
0.52175 0.45000
0.53416 0.75000
0.55544 0.75000
0.58264 0.75000
0.61115 0.75000
0.68995 0.75000
0.80318 0.75000
EOD
$D5 << EOD
0.54198 0.40000
0.54875 0.75000
0.56588 0.75000
0.58892 0.75000
0.62172 0.75000
0.69136 0.75000
0.80026 0.75000
EOD
$D6 << EOD
0.03029 0.10000
0.03617 0.10000
0.05011 0.10000
0.07397 0.10000
0.10237 0.10000
0.15850 0.15000
EOD
$D7 << EOD
0.04289 0.10000
0.06506 0.10000
0.10238 0.10000
0.15938 0.10000
0.20684 0.10000
0.35265 0.10000
0.54349 0.10000
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
