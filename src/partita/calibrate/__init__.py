"""``partita calibrate``: measure this machine, fit the cost model's terms, write a hardware
file the planner reads.

* :mod:`.hardware_file` runs under torchrun (``python -m partita.calibrate.hardware_file``):
  measure, fit, write the file;
* :mod:`.measure` times each term (torch); :mod:`.fit` and :mod:`.overlap` fit them (pure
  functions, no torch);
* :mod:`.refine` refines a hardware file from ``partita train`` / ``partita profile`` run
  directories (``--from-profile``).
"""
