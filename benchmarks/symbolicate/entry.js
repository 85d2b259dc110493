// A large real bundle: several big npm packages, kept whole (no tree shaking of the namespaces).
import * as dateFns from "date-fns";
import * as lodash from "lodash-es";
import * as React from "react";
import * as ReactDOM from "react-dom/client";
import * as THREE from "three";

globalThis.libs = { dateFns, lodash, React, ReactDOM, THREE };
