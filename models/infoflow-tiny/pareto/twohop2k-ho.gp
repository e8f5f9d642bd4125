$D0 << EOD
1.00000 0.06667
EOD
$D1 << EOD
0.03956 0.06667
EOD
$D2 << EOD
0.06839 0.13333
0.08684 0.13333
0.14323 0.13333
0.23124 0.13333
0.29050 0.16667
0.48260 0.16667
0.65147 0.16667
EOD
$D3 << EOD
0.11152 0.13333
0.15190 0.16667
0.25477 0.16667
0.40549 0.06667
0.48713 0.06667
0.60484 0.06667
0.73223 0.06667
EOD
$D4 << EOD
0.53298 0.06667
0.54246 0.06667
0.55308 0.06667
0.59994 0.06667
0.60051 0.06667
0.66458 0.06667
0.79547 0.06667
EOD
$D5 << EOD
0.54080 0.10000
0.55115 0.10000
0.56816 0.06667
0.59711 0.06667
0.61964 0.06667
0.73038 0.06667
0.80199 0.06667
EOD
$D6 << EOD
0.05824 0.06667
0.05837 0.06667
0.07639 0.06667
0.09036 0.06667
0.13759 0.06667
0.22718 0.06667
EOD
$D7 << EOD
0.05766 0.06667
0.07390 0.06667
0.12474 0.06667
0.22135 0.03333
0.25098 0.03333
0.41388 0.03333
0.57684 0.10000
EOD
set title "twohop seed 4, 10 chunks x 180 words, 30 examples"
set xlabel "TTFT / FULL (median over examples)"
set ylabel "exact match"
set xrange [0:1.05]
set yrange [0:1.02]
set grid
set key outside right top
set terminal svg size 760,420 noenhanced font "sans,11" background rgb "white"
set output "models/infoflow-tiny/pareto/twohop2k-ho.svg"
plot $D0 using 1:2 with linespoints lw 2 pt 5 ps 0.9 lc rgb "#000000" title "FULL", \
  $D1 using 1:2 with linespoints lw 2 pt 6 ps 0.9 lc rgb "#999999" title "NONE", \
  $D2 using 1:2 with linespoints lw 2 pt 7 ps 0.9 lc rgb "#1f77b4" title "INFOFLOW", \
  $D3 using 1:2 with linespoints lw 2 pt 8 ps 0.9 lc rgb "#d62728" title "INFOFLOW_BLEND", \
  $D4 using 1:2 with linespoints lw 2 pt 9 ps 0.9 lc rgb "#2ca02c" title "CACHEBLEND", \
  $D5 using 1:2 with linespoints lw 2 pt 10 ps 0.9 lc rgb "#ff7f0e" title "CACHEBLEND_PARTIAL", \
  $D6 using 1:2 with linespoints lw 2 pt 11 ps 0.9 lc rgb "#9467bd" title "EPIC", \
  $D7 using 1:2 with linespoints lw 2 pt 12 ps 0.9 lc rgb "#8c564b" title "RANDOM"
set terminal pngcairo size 760,420 noenhanced font "sans,9"
set output "models/infoflow-tiny/pareto/twohop2k-ho.png"
replot
