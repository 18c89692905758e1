"""Many clients, processes and files: partial participation, the distributed engine, streaming data."""
