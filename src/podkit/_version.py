"""podkit's version, in a module of its own so that reading it imports nothing else (the
package's `__version__`, saved model records and run metadata all read it here)."""

__version__ = "0.1.0"
