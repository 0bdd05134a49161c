"""Several engine processes behind one port (`speechrt serve --workers N`): the front process (front.py) holds the
port and hands each accepted connection to the least-loaded worker process (worker.py), each with its own models,
Engine and SpeechServer; what they share (board.py) and the one /metrics page of them all (figures.py)."""
