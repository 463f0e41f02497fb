"""The output transaction: the output folder and its lock, the file sink, the JSON envelope and TensorBoard."""
