"""The probe's memory: the peak model (one process, one rank), measured phases, calibration."""
