"""Wall and CPU time: simulation speed, the compiled step, Flower and its peers, threads, start-up, the GPU path."""
