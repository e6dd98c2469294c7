"""Token specialisation of a timm ViT: prefix-token norms and QKV (:mod:`.convert`) built from token-split layers
(:mod:`.token_split`). Transforms models only; checkpoint files of specialised models are in :mod:`isiwatch.io`."""
