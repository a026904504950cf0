"""The package's version (``precsearch.__version__``), recorded with every study and export."""

__version__ = "0.1.0"
