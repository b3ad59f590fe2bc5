set terminal pngcairo size 960,540 font "sans,10"
set output "latency.png"
set grid
set key outside right top
set multiplot layout 1,3 title "Latency at fixed rates (open loop, perf/openload): percent of the slowest proxy's saturation rate"
set logscale y
set xlabel "load, % of saturation"
set ylabel "µs"
set key inside top left font ",8"
set xtics (25, 50, 75)
set xrange [15:85]
set title "p50"
plot "rate-origin.dat" using 1:2 with linespoints lw 2 pt 7 lc 8 title "origin", "rate-sluice.dat" using 1:2 with linespoints lw 2 pt 7 lc 1 title "sluice", "rate-nginx.dat" using 1:2 with linespoints lw 2 pt 7 lc 2 title "nginx", "rate-haproxy.dat" using 1:2 with linespoints lw 2 pt 7 lc 3 title "haproxy"
set title "p99"
plot "rate-origin.dat" using 1:3 with linespoints lw 2 pt 7 lc 8 title "origin", "rate-sluice.dat" using 1:3 with linespoints lw 2 pt 7 lc 1 title "sluice", "rate-nginx.dat" using 1:3 with linespoints lw 2 pt 7 lc 2 title "nginx", "rate-haproxy.dat" using 1:3 with linespoints lw 2 pt 7 lc 3 title "haproxy"
set title "p99.9"
plot "rate-origin.dat" using 1:4 with linespoints lw 2 pt 7 lc 8 title "origin", "rate-sluice.dat" using 1:4 with linespoints lw 2 pt 7 lc 1 title "sluice", "rate-nginx.dat" using 1:4 with linespoints lw 2 pt 7 lc 2 title "nginx", "rate-haproxy.dat" using 1:4 with linespoints lw 2 pt 7 lc 3 title "haproxy"
unset multiplot
