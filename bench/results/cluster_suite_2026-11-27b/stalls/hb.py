import time, sys
out = open(sys.argv[1], "w")
end = time.monotonic() + float(sys.argv[2])
last = time.monotonic(); lastw = time.time()
while time.monotonic() < end:
    time.sleep(0.05)
    now = time.monotonic(); noww = time.time()
    if now - last > 1.0:
        out.write("%.3f gap %.2f s (wall %.2f)\n" % (noww, now - last, noww - lastw)); out.flush()
    last = now; lastw = noww
out.write("done\n")
