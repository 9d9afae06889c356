"""The training process's own pieces: its forward step, the progress watch, and what a checkpoint
folder says about the run that saved it."""
