"""The local cluster's delay line, for kernels without netem (docs/MULTINODE.md, "Latency
without netem"). Runs in the switch's network namespace. iptables rules there
(scripts/cluster/net.sh) hand every frame crossing a delayed port to NFQUEUE QUEUE; this
program accepts each one once the delays of its ports have passed: the port it came in on
plus the port it leaves by, so a path through two delayed hosts is delayed by both, as
netem on both links would.

    python3 scripts/cluster/delay.py --queue N --config FILE --ack FILE

FILE holds one "PORT DELAY_MS" per line; SIGHUP makes the program read it again, then it
copies it to the ack file (scripts/cluster.sh waits for that before it returns).

Stdlib only: the netlink part is a few fixed structs. The queue is bound with fail-open
(and the rules use --queue-bypass), so a full queue or a stopped program lets frames pass
undelayed instead of dropping them; `status` and `shape` say loudly when it died. Only the
packets' metadata crosses into user space (copy mode META, GSO packets whole), so a
64 KB TCP burst is one verdict: 1 Gbit/s is about 2,000 verdicts a second.
"""
import argparse
import os
import select
import signal
import socket
import struct
import sys
import time
from collections import deque
from pathlib import Path

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
MSG_PACKET, MSG_VERDICT, MSG_CONFIG = (NFNL_SUBSYS_QUEUE << 8) | 0, (NFNL_SUBSYS_QUEUE << 8) | 1, (NFNL_SUBSYS_QUEUE << 8) | 2
NLMSG_ERROR = 2
NLM_F_REQUEST, NLM_F_ACK = 1, 4
CFG_CMD, CFG_PARAMS, CFG_QUEUE_MAXLEN, CFG_MASK, CFG_FLAGS = 1, 2, 3, 4, 5
CMD_BIND = 1
COPY_META = 1
F_FAIL_OPEN, F_GSO = 1, 4
A_PACKET_HDR, A_VERDICT_HDR, A_PHYSINDEV, A_PHYSOUTDEV = 1, 2, 7, 8
NF_ACCEPT = 1
SOL_NETLINK, NETLINK_NO_ENOBUFS = 270, 5
QUEUE_MAXLEN = 65536  # frames held at once; beyond it fail-open passes them undelayed
RCVBUF = 8 << 20
RT_PRIORITY = 10
MAX_WAIT_S = 0.05  # how late a SIGHUP is seen at worst


def attr(kind: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    head = struct.pack("=HH", 4 + len(payload), kind)
    return head + payload + b"\0" * (-len(payload) % 4)


def message(kind: int, queue: int, body: bytes, flags: int = NLM_F_REQUEST, seq: int = 0) -> bytes:
    """nlmsghdr + nfgenmsg (AF_UNSPEC, version 0, the queue number big-endian) + attributes."""
    payload = struct.pack("!BBH", socket.AF_UNSPEC, 0, queue) + body
    return struct.pack("=IHHII", 16 + len(payload), kind, flags, seq, 0) + payload


def verdict(queue: int, packet_id: int) -> bytes:
    return message(MSG_VERDICT, queue, attr(A_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, packet_id)))


def attributes(data: memoryview) -> dict:
    """type -> payload of a packet message's attributes (after nlmsghdr and nfgenmsg)."""
    found, at = {}, 20
    while at + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, at)
        if length < 4:
            break
        found[kind & 0x3FFF] = data[at + 4:at + length]
        at += (length + 3) & ~3
    return found


def open_queue(queue: int) -> socket.socket:
    """Bind QUEUE with metadata-only copies, whole GSO packets and fail-open; each step acked."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.setsockopt(socket.SOL_SOCKET, 33, RCVBUF)  # SO_RCVBUFFORCE: root may exceed rmem_max
    sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)  # an overrun is fail-open's business
    sock.bind((0, 0))
    steps = [attr(CFG_CMD, struct.pack("!BBH", CMD_BIND, 0, 0)),
             attr(CFG_PARAMS, struct.pack("!IB", 0, COPY_META)),
             attr(CFG_QUEUE_MAXLEN, struct.pack("!I", QUEUE_MAXLEN)),
             attr(CFG_MASK, struct.pack("!I", F_FAIL_OPEN | F_GSO)) + attr(CFG_FLAGS, struct.pack("!I", F_FAIL_OPEN | F_GSO))]
    for seq, body in enumerate(steps, 1):
        sock.send(message(MSG_CONFIG, queue, body, NLM_F_REQUEST | NLM_F_ACK, seq))
        reply = sock.recv(65536)
        kind, = struct.unpack_from("=H", reply, 4)
        code, = struct.unpack_from("=i", reply, 16) if kind == NLMSG_ERROR else (0,)
        if code:
            raise SystemExit(f"delay: NFQUEUE {queue} config step {seq} refused: {os.strerror(-code)} "
                             "(another program bound to it, or no nfnetlink_queue in this kernel)")
    return sock


def read_config(path: Path) -> dict:
    """ifindex -> delay in seconds, for the ports named in PATH that exist in this namespace."""
    delays = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        name, _, ms = line.partition(" ")
        try:
            delays[socket.if_nametoindex(name)] = float(ms) / 1e3
        except OSError:
            print(f"delay: no port {name} in the switch; its delay is ignored", file=sys.stderr, flush=True)
    return delays


class Line:
    """Frames waiting, one FIFO per delay value (frames of one delay leave in arrival order),
    and the verdicts due, sent together in one sendmsg."""

    def __init__(self, sock: socket.socket, queue: int):
        self.sock, self.queue = sock, queue
        self.waiting: dict = {}
        self.due: list = []

    def take(self, data: memoryview, now: float, delays: dict) -> None:
        found = attributes(data)
        packet_id, = struct.unpack_from("!I", found[A_PACKET_HDR])
        delay = sum(delays.get(struct.unpack("!I", found[k])[0], 0.0) for k in (A_PHYSINDEV, A_PHYSOUTDEV)
                    if k in found)
        if delay <= 0:
            self.due.append(verdict(self.queue, packet_id))
        else:
            self.waiting.setdefault(delay, deque()).append((now + delay, packet_id))

    def release(self, now: float) -> float:
        """Send every verdict now due; return seconds until the next one (or MAX_WAIT_S)."""
        wait = MAX_WAIT_S
        for fifo in self.waiting.values():
            while fifo and fifo[0][0] <= now:
                self.due.append(verdict(self.queue, fifo.popleft()[1]))
            if fifo:
                wait = min(wait, fifo[0][0] - now)
        while self.due:  # the socket buffer takes a few thousand at once; send in slices
            self.sock.send(b"".join(self.due[:512]))
            del self.due[:512]
        return max(0.0, wait)


def on_time() -> str:
    """A wire delays by the same time under any load: the program asks for a real-time
    priority (it sleeps between verdicts, so it takes little CPU from anyone); where that is
    refused, the highest nice level, and it says so."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(RT_PRIORITY))
        return f"SCHED_FIFO {RT_PRIORITY}"
    except OSError as e:
        print(f"delay: WARNING: no real-time priority ({e}); delays grow with the machine's load",
              file=sys.stderr, flush=True)
        os.nice(-20)
        return "nice -20"


def serve(queue: int, config: Path, ack: Path) -> None:
    priority = on_time()
    sock = open_queue(queue)
    sock.setblocking(False)
    reload = [True]
    signal.signal(signal.SIGHUP, lambda *_: reload.__setitem__(0, True))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    line, delays, buffer = Line(sock, queue), {}, bytearray(65536)
    print(f"delay: serving NFQUEUE {queue} (pid {os.getpid()}, {priority})", flush=True)
    wait = MAX_WAIT_S
    while True:
        if reload[0]:
            reload[0] = False
            delays = read_config(config)
            ack.write_text(config.read_text() if config.exists() else "")
        select.select([sock], [], [], wait)  # microseconds; poll and epoll round up to whole ms
        now = time.monotonic()
        for _ in range(4096):  # bounded, so a flood cannot hold back the verdicts due
            try:
                size = sock.recv_into(buffer)
            except BlockingIOError:
                break
            view = memoryview(buffer)[:size]
            kind, = struct.unpack_from("=H", view, 4)
            if kind == MSG_PACKET:
                line.take(view, now, delays)
        wait = line.release(time.monotonic())


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0], allow_abbrev=False)
    p.add_argument("--queue", type=int, required=True)
    p.add_argument("--config", type=Path, required=True)
    p.add_argument("--ack", type=Path, required=True)
    args = p.parse_args()
    serve(args.queue, args.config, args.ack)


if __name__ == "__main__":
    main()
