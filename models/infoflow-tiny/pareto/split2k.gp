$D0 << EOD
1.00000 1.00000
EOD
$D1 << EOD
0.03286 0.00000
EOD
$D2 << EOD
0.07250 0.15000
0.14124 0.15000
0.21559 0.25000
0.26257 0.35000
0.44422 0.50000
0.60607 0.75000
EOD
$D3 << EOD
0.29679 0.75000
0.32625 1.00000
0.36708 1.00000
0.39371 1.00000
0.55017 1.00000
0.66075 1.00000
EOD
$D4 << EOD
0.54834 1.00000
0.57558 1.00000
0.59818 1.00000
0.60849 1.00000
0.70468 1.00000
0.80837 1.00000
EOD
$D5 << EOD
0.55127 1.00000
0.59519 1.00000
0.60574 1.00000
0.61739 1.00000
0.72719 1.00000
0.77706 1.00000
EOD
$D6 << EOD
0.03775 0.00000
0.04002 0.00000
0.04738 0.15000
0.07189 0.15000
0.10589 0.20000
0.18095 0.25000
EOD
$D7 << EOD
0.06504 0.00000
0.12051 0.00000
0.21987 0.00000
0.24618 0.00000
0.39497 0.05000
0.64740 0.20000
EOD
set title "split seed 0, 8 chunks x 220 words, 20 examples"
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
