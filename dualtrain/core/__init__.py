"""Core: what both backends compute, defined once and framework-free.

The data and its sharding plan (``data``, ``plan``), the model vocabulary and canonical weight
names (``model``, ``weights``), the learning-rate schedule (``schedule``) and the arithmetic both
backends must do identically, written against a small array namespace each backend supplies
(``batchnorm``, ``dropout``, the update rules).
"""
