from torchvision._stub import module_getattr

__getattr__ = module_getattr("torchvision")
__version__ = "0.0.0+stub"
