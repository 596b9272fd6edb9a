"""The attempt: try a damped step, decide acceptance, move λ (Marquardt 1963; Nielsen 1999).

One step's system is assembled once (``_lm.assembly``); the attempts solve it for the
damping rule's λ (``_lm.damping``) until one is accepted or a stopping test holds:

* ``decide``: the decision of one attempt (acceptance, the rounding stop), for floats
  and tensors alike;
* ``eager``: the attempts on floats read from the devices, for every kind of step;
* ``pure``: one attempt as a pure function of tensors, and ``fused``, the attempts by it;
* ``paths``: which of the two a step takes, and ``graphs``, the pure attempt compiled on
  CPUs or captured as a CUDA graph;
* ``step``: the attempts of one step from its assembled system (`damped_step`).
"""
