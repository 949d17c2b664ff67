"""The data path every mode shares: CIFAR-10's files on disk (cifar_files), the generated
synthetic set (synthetic), the train/valid/test splits and their preparation (dataset),
augmentation (augment) and the loader contract with its samplers (loaders). It may import
handler/runtime; the modes and handler/train import it, and it imports no mode."""
