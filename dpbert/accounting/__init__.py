"""THE owner of ε decisions: the accounted σ, the ε → σ solver, the dataset's budget gate.

``epsilon`` (the only caller of dp-accounting's ``get_epsilon``), ``sigma`` (the σ a step is
charged at), ``solver`` (σ for a target ε), ``accountant`` (a run's ledger and plan), ``compose``
(a dataset's composed figures), ``filter`` (the pinned Rényi filter), ``gate`` (the verdict every
surface asks), ``reserve`` / ``target`` (the ledger's writes, the gate inside their CAS).
Above ``privacy``, ``ledger`` and ``storage``; below ``model``, the stages and the pipeline.
"""
