"""``partita profile``: run a plan under the profiler and compare what it measured with the
prediction.

* :mod:`.collective_counter` counts the bytes each collective call hands the backend during
  the run (what the trace cannot show on gloo);
* :mod:`.compare_terms` sets each term of the prediction beside the measured one;
  :mod:`.dp_bytes` does the same for data-parallel gradient bytes;
* :mod:`.report` writes the HTML page.

Reading the traces themselves is :mod:`partita.analyze`; calibrating the cost model from
measurements is :mod:`partita.calibrate`.
"""
