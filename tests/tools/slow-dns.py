#!/usr/bin/env python3
"""A nameserver that answers late: every A query gets ADDRESS after DELAY seconds, every other
query an empty answer after the same delay (tests/it/faults/46_dns_stall.sh).

    slow-dns.py LISTEN_ADDRESS DELAY_S ADDRESS

Listens on LISTEN_ADDRESS, UDP port 53; prints "listening" once bound. Each query is answered on
a timer of its own, so queries asked together (A and AAAA) are answered together."""
import socket
import struct
import sys
import threading


def answer(query, address):
    """The response to one query: its id and question, and one A record of address when the
    question is for an A record (type 1), none otherwise."""
    (qid,) = struct.unpack("!H", query[:2])
    end = 12
    while query[end] != 0:  # the question's name: length-prefixed labels, then a zero
        end += query[end] + 1
    qtype = struct.unpack("!H", query[end + 1 : end + 3])[0]
    question = query[12 : end + 5]
    records = b""
    if qtype == 1:
        records = struct.pack("!HHHIH", 0xC00C, 1, 1, 60, 4) + socket.inet_aton(address)
    header = struct.pack("!HHHHHH", qid, 0x8180, 1, 1 if records else 0, 0, 0)
    return header + question + records


def main():
    listen, delay, address = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((listen, 53))
    print("listening", flush=True)
    while True:
        query, peer = sock.recvfrom(512)
        try:
            response = answer(query, address)
        except (IndexError, struct.error):
            continue  # not a query this stand-in reads
        threading.Timer(delay, sock.sendto, (response, peer)).start()


if __name__ == "__main__":
    main()
