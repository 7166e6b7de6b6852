"""Pure logic of mamba2-guard: no GPU, git, network or clock; plain data in, plain data out."""
