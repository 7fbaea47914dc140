import socket, threading, time, sys
def run(src, dst, nbytes=32<<20):
    ls = socket.socket(); ls.bind((dst, 0)); ls.listen(1); port = ls.getsockname()[1]
    got = [0]
    def rx():
        c, _ = ls.accept()
        while True:
            b = c.recv(1 << 20)
            if not b: break
            got[0] += len(b)
        c.close()
    t = threading.Thread(target=rx); t.start()
    s = socket.socket(); s.bind((src, 0)); s.connect((dst, port))
    buf = b'x' * (1 << 20); t0 = time.time()
    for _ in range(nbytes >> 20): s.sendall(buf)
    s.close(); t.join(); dt = time.time() - t0
    print(f"{src} -> {dst}: {got[0]} B in {dt:.3f} s = {got[0]*8/dt/1e6:.0f} Mbit/s")
for src, dst in [("127.0.1.1","127.0.1.1"),("127.0.2.1","127.0.2.1"),("127.0.1.1","127.0.2.1"),("127.0.2.1","127.0.1.1"),("127.0.0.1","127.0.0.1")]:
    run(src, dst)
