"""Spins in a known Python function for the time given (seconds), for CPU-sampling tests."""
import sys
import time


def spin(seconds):
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:  # line: loop
        n += 1
    return n


def main():
    return spin(float(sys.argv[1]))  # line: main


main()  # line: module
