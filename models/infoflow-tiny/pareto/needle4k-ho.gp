$D0 << EOD
1.00000 1.00000
EOD
$D1 << EOD
0.02306 0.85000
EOD
$D2 << EOD
0.05095 0.90000
0.07172 0.90000
0.13253 0.90000
0.21357 0.95000
0.28156 0.95000
0.46337 1.00000
0.67911 0.95000
EOD
$D3 << EOD
0.08714 0.95000
0.13131 0.95000
0.25292 0.95000
0.38864 1.00000
0.46128 1.00000
0.58103 1.00000
0.75167 1.00000
EOD
$D4 << EOD
0.53721 1.00000
0.55237 1.00000
0.56599 1.00000
0.58682 1.00000
0.60941 1.00000
0.69149 1.00000
0.80330 1.00000
EOD
$D5 << EOD
0.54761 1.00000
0.54875 1.00000
0.55401 1.00000
0.59026 1.00000
0.61263 1.00000
0.69676 1.00000
0.79923 1.00000
EOD
$D6 << EOD
0.03300 0.85000
0.03494 0.85000
0.04527 0.85000
0.06795 0.85000
0.09761 0.85000
0.14441 0.90000
EOD
$D7 << EOD
0.04384 0.85000
0.06497 0.95000
0.10380 0.95000
0.16138 0.95000
0.21831 0.90000
0.36278 0.90000
0.55480 0.95000
EOD
set title "needle seed 3, 12 chunks x 260 words, 20 examples"
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
