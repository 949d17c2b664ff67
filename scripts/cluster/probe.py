"""Measure a link of the local cluster from inside its hosts: round-trip time (UDP echo)
and bulk TCP throughput. Stdlib only; run each half with `scripts/cluster.sh exec HOST`.

    python scripts/cluster/probe.py serve [--port 5201]             on one host: echo + sink
    python scripts/cluster/probe.py rtt HOST [--count 20]           round trips, ms (JSON)
    python scripts/cluster/probe.py bulk HOST [--seconds 4]         one TCP stream, Mbit/s (JSON)

docs/MULTINODE.md ("Latency without netem") gives the table these measure.
"""
import argparse
import json
import socket
import statistics
import struct
import threading
import time

CHUNK = 1 << 16


def echo(port: int) -> None:
    """Answer every UDP datagram with itself."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("0.0.0.0", port))
        while True:
            data, peer = sock.recvfrom(2048)
            sock.sendto(data, peer)


def sink(port: int) -> None:
    """Read each TCP stream to its end; answer with the bytes and the seconds from the first
    byte to the end, as the receiver saw them (what crossed the link, not what was buffered)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("0.0.0.0", port))
        server.listen()
        while True:
            conn, _ = server.accept()
            with conn:
                total, first = 0, None
                while data := conn.recv(CHUNK):
                    first = first or time.monotonic()
                    total += len(data)
                conn.sendall(struct.pack("!Qd", total, time.monotonic() - (first or time.monotonic())))


def serve(port: int) -> None:
    threading.Thread(target=echo, args=(port,), daemon=True).start()
    sink(port)


def rtt(host: str, port: int, count: int) -> dict:
    """COUNT round trips, 50 ms apart; a lost datagram counts as lost, not as a time."""
    times = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(1.0)
        for k in range(count + 1):
            start = time.monotonic()
            sock.sendto(struct.pack("!I", k), (host, port))
            try:
                while struct.unpack("!I", sock.recv(64))[0] != k:
                    pass
            except socket.timeout:
                continue
            if k:  # the first one also resolves the peer's address (ARP): left out
                times.append((time.monotonic() - start) * 1e3)
            time.sleep(0.05)
    return {"rtt_ms_median": statistics.median(times) if times else None, "rtt_ms_min": min(times, default=None),
            "rtt_ms_max": max(times, default=None), "sent": count, "lost": count - len(times)}


def bulk(host: str, port: int, seconds: float) -> dict:
    """One TCP stream for SECONDS; the rate is the receiver's."""
    payload = b"\0" * CHUNK
    with socket.create_connection((host, port), timeout=30) as conn:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
        answer = b""
        while len(answer) < 16 and (data := conn.recv(16 - len(answer))):
            answer += data
    total, elapsed = struct.unpack("!Qd", answer)
    return {"mbit_s": total * 8 / elapsed / 1e6, "bytes": total, "seconds": elapsed}


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0], allow_abbrev=False)
    p.add_argument("what", choices=("serve", "rtt", "bulk"))
    p.add_argument("host", nargs="?")
    p.add_argument("--port", type=int, default=5201)
    p.add_argument("--count", type=int, default=20)
    p.add_argument("--seconds", type=float, default=4.0)
    args = p.parse_args()
    if args.what == "serve":
        serve(args.port)
    elif not args.host:
        p.error(f"{args.what} needs the host that runs `serve`")
    else:
        found = rtt(args.host, args.port, args.count) if args.what == "rtt" else bulk(args.host, args.port, args.seconds)
        print(json.dumps(found))


if __name__ == "__main__":
    main()
