set terminal pngcairo size 960,540 font "sans,10"
set output "scaling.png"
set grid
set key outside right top
set title "Requests/s by workers (GET)"
set xlabel "workers"
set ylabel "requests/s"
set yrange [0:*]
set xtics 1
plot "scaling-sluice.dat" using 1:2 with linespoints lw 2 pt 7 lc 1 title "sluice", "scaling-nginx.dat" using 1:2 with linespoints lw 2 pt 7 lc 2 title "nginx", "scaling-haproxy.dat" using 1:2 with linespoints lw 2 pt 7 lc 3 title "haproxy"
