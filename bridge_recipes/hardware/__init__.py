"""The hardware and the installed stack: the GPU table, a process's GPU memory, what the installed
packages provide, the wheelhouse for machines without a registry."""
