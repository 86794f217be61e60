"""Data for the training loop: generated ListOps and Pathfinder, Fashion-MNIST pixels, plain
text (language modelling, classification, retrieval)."""
from .fmnist import FashionMNIST
from .listops import ListOps
from .pathfinder import Pathfinder
from .text import TextClassification, TextLM, TextRetrieval

__all__ = ["FashionMNIST", "ListOps", "Pathfinder", "TextClassification", "TextLM", "TextRetrieval"]
