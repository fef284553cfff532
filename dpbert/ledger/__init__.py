"""One privacy budget per DATASET, across every run and output folder: the dataset ledger document.

``identity`` (which dataset, where its ledger lives), ``composition`` (the count-free records an
entry charges), ``dataset`` (the document, read fail-closed). What is admitted and the writes:
``dpbert.accounting`` (the budget gate, reserve / finalize by compare-and-swap).
"""
