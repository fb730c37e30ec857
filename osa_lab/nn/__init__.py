"""Neural-network building blocks: attention layers, models and the named presets.

* :mod:`osa_lab.nn.attention`: every attention variant (orthogonal, softmax, value-SkipInit,
  the cutting-skip initialisation) and their shared bases.
* :mod:`osa_lab.nn.models`: the skipless / normless encoders and classifiers.
* :mod:`osa_lab.nn.presets`: the named model presets (``skipless-osa``, ``pure-ssa``, …).

This wing imports only :mod:`osa_lab.ops` and :mod:`osa_lab.errors` (docs/architecture.md).
"""
