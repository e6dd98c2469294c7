"""Token specialisation of a timm ViT: prefix-token norms and QKV (`isiwatch.specialization.convert`) built from
token-split layers (`isiwatch.specialization.token_split`). Transforms models only; checkpoint files of specialised
models are in `isiwatch.io`."""
