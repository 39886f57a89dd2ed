"""jaxpr → stage graph (nodes, lifted edges, probe points) and probe instrumentation."""

from .build import build_graph as build_graph
from .instrument import instrument as instrument
from .instrument import instrument_jaxpr as instrument_jaxpr
from .model import Edge as Edge
from .model import Node as Node
from .model import Note as Note
from .model import ProbePoint as ProbePoint
from .model import StageGraph as StageGraph
from .tesseract import default_name as default_name
