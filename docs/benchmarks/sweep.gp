set terminal pngcairo size 960,540 font "sans,10"
set output "sweep.png"
set grid
set key outside right top
set title "Requests/s vs connections (wrk, one proxy core)"
set logscale x
set xlabel "connections"
set ylabel "requests/s"
set yrange [0:*]
plot "sweep-sluice.dat" using 1:2 with linespoints lw 2 pt 7 lc 1 title "sluice", "sweep-nginx.dat" using 1:2 with linespoints lw 2 pt 7 lc 2 title "nginx", "sweep-haproxy.dat" using 1:2 with linespoints lw 2 pt 7 lc 3 title "haproxy", "sweep-sluice-knee.dat" using 1:2 with points pt 6 ps 3 lw 2 lc 1 title "knee, sluice", "sweep-nginx-knee.dat" using 1:2 with points pt 6 ps 3 lw 2 lc 2 title "knee, nginx", "sweep-haproxy-knee.dat" using 1:2 with points pt 6 ps 3 lw 2 lc 3 title "knee, haproxy"
