"""torch.library custom ops, their fakes and autograd formulas, the eager autograd route and the MLP backward."""
