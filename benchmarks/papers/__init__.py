"""CPU-scale reproductions of the papers' experiments: LocalSCGDAM, FCSG, FeDXL, CODASCA's windows."""
