"""The virtual clock: every arrival updates the server, staleness from simulated compute
and communication times.

``virtual_clock`` draws the event order (model-free, before the run); ``engine`` trains
groups of arrivals in one vmap and applies them one by one in arrival order (the
algorithm's ``server_step``, or a round rule as rounds of one); ``config``
(``AsyncRunConfig``), ``experiment`` (the runs of a configuration: ``run_virtual_clock``) and
``report`` (progress, summaries, tables) around them.
"""
