set terminal pngcairo size 1100,700 font "sans,10"
set output "features.png"
set grid
set key outside right top
set title "CPU µs per request by feature (GET, one core)"
set style fill solid 0.8
set boxwidth 0.7
set key off
set ylabel "CPU µs/request"
set yrange [0:*]
set bmargin 16
set rmargin 12
set xtics rotate by -45 left font ",8"
plot "features.dat" using 0:2:3:xtic(1) with boxes lc variable
