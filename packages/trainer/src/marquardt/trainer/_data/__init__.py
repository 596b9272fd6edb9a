"""The data of a run: loaders, datasets or dataset factories, and each rank's share of them."""
