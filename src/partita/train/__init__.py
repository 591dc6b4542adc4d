"""Launch and run training: ``partita train`` (launch.py) starts torchrun, which runs worker.py."""
