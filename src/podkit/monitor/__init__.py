"""Instruments that say what the job is doing: progress, and later goodput, compiles, memory."""
