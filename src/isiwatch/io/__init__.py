"""Reading and writing what enters and leaves a model: checkpoints, Hugging Face directories, data sets, and the
images a model takes (its normalisation and input size)."""
