"""kcover detector for MetaX GPU nodes: daily day-2 checks through `mx-smi` and `ibv_devinfo`."""
