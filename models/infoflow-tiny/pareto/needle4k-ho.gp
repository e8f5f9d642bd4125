$D0 << EOD
1.00000 1.00000
EOD
$D1 << EOD
0.02348 0.87500
EOD
$D2 << EOD
0.06951 1.00000
0.13402 1.00000
0.26205 1.00000
0.46617 1.00000
0.76068 1.00000
EOD
$D3 << EOD
0.23883 1.00000
0.27945 1.00000
0.46139 1.00000
0.50077 1.00000
0.95441 1.00000
EOD
$D4 << EOD
0.48111 1.00000
0.51203 1.00000
0.55406 1.00000
0.57751 1.00000
0.58528 1.00000
EOD
$D5 << EOD
0.63315 1.00000
0.64060 1.00000
0.64803 1.00000
0.86143 1.00000
1.20664 1.00000
EOD
$D6 << EOD
0.03476 0.87500
0.03527 0.87500
0.04155 0.87500
0.08077 0.87500
0.08644 0.87500
0.13663 0.87500
EOD
$D7 << EOD
0.06577 1.00000
0.09538 1.00000
0.23350 1.00000
0.38985 1.00000
0.53209 1.00000
EOD
set title "needle seed 3, 12 chunks x 260 words, 8 examples"
set xlabel "TTFT / FULL (median over examples)"
set ylabel "exact match"
set xrange [0:1.05]
set yrange [0:1.02]
set grid
set key outside right top
set terminal svg size 760,420 noenhanced font "sans,11" background rgb "white"
set output "models/infoflow-tiny/pareto/needle4k-ho.svg"
plot $D0 using 1:2 with linespoints lw 2 pt 5 ps 0.9 lc rgb "#000000" title "FULL", \
  $D1 using 1:2 with linespoints lw 2 pt 6 ps 0.9 lc rgb "#999999" title "NONE", \
  $D2 using 1:2 with linespoints lw 2 pt 7 ps 0.9 lc rgb "#1f77b4" title "INFOFLOW", \
  $D3 using 1:2 with linespoints lw 2 pt 8 ps 0.9 lc rgb "#d62728" title "INFOFLOW_BLEND", \
  $D4 using 1:2 with linespoints lw 2 pt 9 ps 0.9 lc rgb "#2ca02c" title "CACHEBLEND", \
  $D5 using 1:2 with linespoints lw 2 pt 10 ps 0.9 lc rgb "#ff7f0e" title "CACHEBLEND_PARTIAL", \
  $D6 using 1:2 with linespoints lw 2 pt 11 ps 0.9 lc rgb "#9467bd" title "EPIC", \
  $D7 using 1:2 with linespoints lw 2 pt 12 ps 0.9 lc rgb "#8c564b" title "RANDOM"
set terminal pngcairo size 760,420 noenhanced font "sans,9"
set output "models/infoflow-tiny/pareto/needle4k-ho.png"
replot
