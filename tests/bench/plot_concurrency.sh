#!/usr/bin/env bash
# Plots serve_bench's concurrency.csv before vs after (PNG + SVG):
#   plot_concurrency.sh BEFORE.csv AFTER.csv OUT_PREFIX
# writes OUT_PREFIX.png and OUT_PREFIX.svg: prefill-heavy QPS, client TTFT
# p50/p99 and decode-heavy generated tokens/s against streams.
set -euo pipefail
if [[ $# -ne 3 || "$1" == --help ]]; then
  echo "usage: $0 BEFORE.csv AFTER.csv OUT_PREFIX" >&2
  exit 2
fi
before=$1 after=$2 out=$3
command -v gnuplot >/dev/null || { echo "gnuplot not installed" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for tag in before after; do
  src=$([[ $tag == before ]] && echo "$before" || echo "$after")
  # columns: streams qps tokens_per_s p50 p99
  awk -F, 'NR > 1 && $1 == "prefill-heavy" {print $3, $8, $9, $10, $12}' "$src" > "$tmp/$tag.prefill"
  awk -F, 'NR > 1 && $1 == "decode-heavy" {print $3, $8, $9, $10, $12}' "$src" > "$tmp/$tag.decode"
done
plot() {
  cat <<GP
set multiplot layout 1,3 title "infoflow-server, closed loop, INFOFLOW r=0.15 (before vs after the scheduler)"
set logscale x 2
set xlabel "streams"
set key top left
set grid
set title "prefill-heavy QPS (max_new_tokens 1)"
set ylabel "QPS"
set yrange [0:*]
plot "$tmp/before.prefill" u 1:2 w lp lw 2 t "before", "$tmp/after.prefill" u 1:2 w lp lw 2 t "after"
set title "prefill-heavy client TTFT"
set ylabel "ms"
set logscale y
set yrange [*:*]
plot "$tmp/before.prefill" u 1:4 w lp lw 2 t "before p50", "$tmp/before.prefill" u 1:5 w lp lw 2 dt 2 t "before p99", \\
     "$tmp/after.prefill" u 1:4 w lp lw 2 t "after p50", "$tmp/after.prefill" u 1:5 w lp lw 2 dt 2 t "after p99"
unset logscale y
set title "decode-heavy generated tokens/s"
set ylabel "tokens/s"
set yrange [0:*]
plot "$tmp/before.decode" u 1:3 w lp lw 2 t "before", "$tmp/after.decode" u 1:3 w lp lw 2 t "after"
unset multiplot
GP
}
{ echo 'set terminal pngcairo size 1500,480 noenhanced'; echo "set output '$out.png'"; plot; } | gnuplot
{ echo 'set terminal svg size 1500,480 noenhanced'; echo "set output '$out.svg'"; plot; } | gnuplot
echo "wrote $out.png $out.svg"
