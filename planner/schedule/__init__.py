"""What a schedule does in time: torch's action orders (``orders``), the event simulator (``simulate``)
and the timeline pictures (``timeline``). Pure Python: no torch import; uses only the base modules
(``planner.errors``, ``planner.fileio``)."""
