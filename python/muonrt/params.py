"""split_params: which parameters go to Muon and which to AdamW.

Muon is for the hidden layers' weight matrices. Embeddings, the output
head, norms' scales and biases (and anything not 2-D) are usually trained
with AdamW (Keller Jordan's Muon post; torch.optim.Muon's documentation):

    muon_params, other_params = muonrt.split_params(model)
    opt_muon = muonrt.Muon(muon_params, lr=0.02)
    opt_adamw = torch.optim.AdamW([p for _, p in other_params], lr=3e-4)
"""
import torch

__all__ = ["split_params", "HEAD_NAMES"]

# Module names taken for an output head (the name of the module that owns
# the weight, i.e. the last component before ".weight").
HEAD_NAMES = ("lm_head", "output", "head", "classifier")


def _matches(name, patterns):
    for e in patterns:
        if name == e or name.startswith(e + "."):
            return True
    return False


def split_params(model, exclude=(), head_names=HEAD_NAMES,
                 exclude_last_linear=True):
    """Splits ``model.named_parameters()`` into two lists of (name, param):

    muon_params: 2-D weight matrices of the hidden layers, i.e. every
        parameter with ``p.ndim == 2`` that requires grad, except
        - weights of nn.Embedding / nn.EmbeddingBag modules (tied output
          heads included: named_parameters() lists a tied weight once, under
          the embedding),
        - weights of a module named one of `head_names` (the last component
          of the module path: "lm_head.weight", "model.output.weight"; not
          "attn.output.dense.weight"),
        - the weight of the last nn.Linear in ``model.modules()`` order when
          `exclude_last_linear` (the classifier of an MLP),
        - names in `exclude`: exact parameter names or module prefixes
          ("encoder.pos_emb" excludes "encoder.pos_emb.weight").
    other_params: everything else in named_parameters() order (embeddings,
        head, norms, biases, 1-D/3-D/4-D parameters, frozen parameters),
        for a companion torch.optim.AdamW.
    Every parameter is in exactly one list; both keep the model's order.
    """
    if isinstance(exclude, str):
        exclude = [exclude]
    embedding_ids = set()
    last_linear = None
    for module in model.modules():
        if isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
            embedding_ids.add(id(module.weight))
        if isinstance(module, torch.nn.Linear):
            last_linear = module
    head_ids = set()
    if exclude_last_linear and last_linear is not None:
        head_ids.add(id(last_linear.weight))
    muon, other = [], []
    for name, p in model.named_parameters():
        module_name = name.rsplit(".", 1)[0] if "." in name else ""
        owner = module_name.rsplit(".", 1)[-1]
        is_head = id(p) in head_ids or owner in head_names
        if (p.ndim == 2 and p.requires_grad and id(p) not in embedding_ids
                and not is_head and not _matches(name, exclude)):
            muon.append((name, p))
        else:
            other.append((name, p))
    return muon, other
