#!/usr/bin/python3
"""A delay line for `--lan-delay` (launcher/lan.ts): this kernel has no netem (nor fq, etf or
taprio), so a host's outgoing packets take a detour through user space. Run inside the host's
namespace: the host's routes to the LAN point at the TUN device DEV; this process reads each IP
packet from it, holds it DELAY_MS, and sends it on through a raw socket marked MARK, which a
policy rule routes out of the host's real link (eth0, shaped by tbf as before). Packets keep
their order (one delay for all: a FIFO). Incoming packets do not pass here: with every host
delayed on the way out, a round trip between two hosts takes 2 x DELAY_MS more.

  lan_delay.py DEV DELAY_MS MARK

Standard library only (Debian's python3). Exits when its stdin closes (the launcher's end of
the pipe: the launcher exited or tore the LAN down) or on SIGTERM.
"""
import collections
import fcntl
import os
import select
import signal
import socket
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
SO_MARK = 36
# At most this many packets held (at 1500 bytes, 12 MB): beyond it the line drops, as a full router queue does.
MAX_HELD = 8192


def main() -> None:
    if len(sys.argv) != 4:
        sys.exit("usage: lan_delay.py DEV DELAY_MS MARK")
    dev, delay_ms, mark = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    if not (0 < delay_ms <= 10_000):
        sys.exit(f"lan_delay.py: DELAY_MS must be in (0, 10000], got {sys.argv[2]}")
    # Replies come in by the real link while the route back points at the TUN: the reverse-path
    # filter would drop them (this namespace's own settings; /proc/sys/net is per namespace).
    conf = "/proc/sys/net/ipv4/conf"
    for name in os.listdir(conf):
        with open(os.path.join(conf, name, "rp_filter"), "w") as f:
            f.write("0")
    tun = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(tun, TUNSETIFF, struct.pack("16sH", dev.encode(), IFF_TUN | IFF_NO_PI))
    out = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    out.setsockopt(socket.SOL_SOCKET, SO_MARK, mark)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    delay = delay_ms / 1000.0
    held: collections.deque = collections.deque()
    stdin = sys.stdin.fileno()
    print(f"lan_delay: {dev} holds packets {delay_ms} ms", flush=True)
    while True:
        now = time.monotonic()
        while held and held[0][0] <= now:
            _, packet = held.popleft()
            if len(packet) >= 20 and packet[0] >> 4 == 4:
                try:
                    out.sendto(packet, (socket.inet_ntoa(packet[16:20]), 0))
                except OSError:
                    pass  # unreachable or a full buffer: dropped, as a router would
        timeout = max(0.0, held[0][0] - now) if held else None
        ready, _, _ = select.select([tun, stdin], [], [], timeout)
        if stdin in ready and not os.read(stdin, 4096):
            return
        if tun in ready:
            arrived = time.monotonic()
            while True:
                try:
                    packet = os.read(tun, 65536)
                except BlockingIOError:
                    break
                if len(held) < MAX_HELD:
                    held.append((arrived + delay, packet))


if __name__ == "__main__":
    main()
