"""What every engine shares: the timeline of who trains and arrives when (``timeline``),
the one local-training loop (``client``), device data, client
keys and evaluation (``device``), divergence (``divergence``), data and model building
(``building``) and the progress lines (``progress``). Nothing here knows an engine."""
