"""Data for the training loop: generated ListOps, Fashion-MNIST pixels, plain text."""
from .fmnist import FashionMNIST
from .listops import ListOps
from .text import TextClassification, TextLM

__all__ = ["FashionMNIST", "ListOps", "TextClassification", "TextLM"]
