"""Bridges from osa_lab to other model libraries.

* :mod:`osa_lab.integrations.timm`: orthogonal self-attention (Zhang & Martens, arXiv 2602.05996)
  in timm's Vision Transformers: a drop-in for ``timm.layers.Attention``, skipless / normless
  blocks, ``create_osa_vit`` and ``convert_to_osa``, and depth metrics / Jacobian κ of timm
  models. The layer, blocks and conversion need the ``timm`` extra alone (``pip install
  'osa_lab[timm]'``); the depth metrics and Jacobians also need the laboratory
  (``pip install 'osa_lab[lab,timm]'``).

Each integration imports its library lazily, so ``import osa_lab.integrations`` never needs it,
and names the extra it lacks when it is used.
"""

