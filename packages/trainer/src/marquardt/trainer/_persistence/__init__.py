"""What a run keeps on disk: the checkpoint file format, the run state in it, the run folder."""
