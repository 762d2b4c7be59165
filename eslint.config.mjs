// @ts-check
import js from '@eslint/js';
import globals from 'globals';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['dist/**', 'dist-dev/**', 'node_modules/**', 'coverage/**'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    languageOptions: { globals: globals.node },
    rules: {
      // Parameter names are read by @Locked templates, so unused ones are part of a signature; Nest's
      // ConfigurableModuleBuilder hands out *_TYPE values that are only used with typeof.
      '@typescript-eslint/no-unused-vars': ['error', { args: 'none', varsIgnorePattern: '^_|_TYPE$', caughtErrors: 'none' }],
    },
  },
);
